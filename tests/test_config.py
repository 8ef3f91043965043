from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.config import ConfigError, load_config


def test_defaults_serve_a_single_node() -> None:
    cfg = load_config(env={})
    assert cfg.server.host == "127.0.0.1"
    assert cfg.server.port == 8000
    assert cfg.sandbox.default_timeout == 300


def test_file_then_env_override(tmp_path: Path) -> None:
    path = tmp_path / "aenv.toml"
    path.write_text('[server]\nport = 9000\n[sandbox]\nmemory_mb = 256\n[vmm]\naccel = "tcg"\n')
    cfg = load_config(path, env={"AENV_SANDBOX_MEMORY_MB": "384", "AENV_HOME": str(tmp_path)})
    assert cfg.server.port == 9000
    assert cfg.sandbox.memory_mb == 384
    assert cfg.vmm.accel == "tcg"
    assert cfg.home == tmp_path
    assert cfg.kit_dir == tmp_path / "kit"


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = tmp_path / "aenv.toml"
    path.write_text("[server]\nport = 9100\n")
    assert load_config(env={"AENV_CONFIG": str(path), "AENV_PORT": "9200"}).server.port == 9200
    assert load_config(env={"AENV_CONFIG": str(path)}).server.port == 9100


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nope]\nx = 1\n", "unknown config section"),
        ("[server]\nprot = 1\n", "unknown config key server.prot"),
        ('[server]\nport = "x"\n', "server.port must be int"),
        ("[server\n", "cannot read config"),
        ("[vmm]\nguest_nice = 20\n", "vmm.guest_nice 20: use 0 to 19"),
    ],
)
def test_bad_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "aenv.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, env={})


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="AENV_SANDBOX_VCPUS"):
        load_config(env={"AENV_SANDBOX_VCPUS": "two"})


def test_state_url_places_the_state_store(tmp_path: Path) -> None:
    home = load_config(env={"AENV_HOME": str(tmp_path)})
    assert home.state_url == f"sqlite:///{tmp_path / 'state.db'}"
    cfg = load_config(env={"AENV_STATE_URL": "sqlite:///srv/aenv/state.db"})
    assert cfg.state_url == "sqlite:////srv/aenv/state.db"
    cfg = load_config(env={"AENV_STATE_URL": "postgres://aenv:pw@db:5432/aenv"})
    assert cfg.state_url == "postgresql://aenv:pw@db:5432/aenv"
    for bad in ("mysql://db/aenv", "sqlite:///", "/srv/state.db"):
        with pytest.raises(ConfigError, match=r"state\.url"):
            load_config(env={"AENV_STATE_URL": bad})
