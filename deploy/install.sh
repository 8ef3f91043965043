#!/bin/sh
# Install AgentENV on a bare Debian 12 host as a systemd service, from this checkout:
#
#   sudo deploy/install.sh [--root DIR] [--prefix /opt/aenv] [--role all|control|node] [--no-apt]
#
# What it does: the Debian packages the server needs (unless --no-apt), a virtualenv at
# PREFIX with aenv installed from the checkout, /etc/aenv/config.toml (kept if present),
# and /etc/systemd/system/aenv.service; with ROOT "/" and systemd running it also enables
# and starts the service. --root installs into another tree (an image being built, or
# a scratch directory for a test) and touches nothing outside it.
set -eu

ROOT=/
PREFIX=/opt/aenv
ROLE=all
APT=1
while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT=$2; shift 2 ;;
        --prefix) PREFIX=$2; shift 2 ;;
        --role) ROLE=$2; shift 2 ;;
        --no-apt) APT=0; shift ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$ROLE" in all|control|node) ;; *) echo "install.sh: --role all|control|node" >&2; exit 2 ;; esac
SRC=$(cd "$(dirname "$0")/.." && pwd)
DEST=$(echo "$ROOT/$PREFIX" | sed 's://*:/:g')
ETC=$(echo "$ROOT/etc" | sed 's://*:/:g')

if [ "$APT" = 1 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3-venv python3-dev gcc pkg-config libfuse3-dev fuse3 qemu-system-x86 qemu-utils \
        busybox-static debootstrap iptables iproute2 e2fsprogs cpio kmod zstd util-linux \
        procps ca-certificates nfs-ganesha nfs-ganesha-vfs rpcbind
fi

python3 -m venv "$DEST"
"$DEST/bin/pip" install -q --upgrade pip
"$DEST/bin/pip" install -q "$SRC"

mkdir -p "$ETC/aenv" "$ETC/systemd/system"
if [ ! -f "$ETC/aenv/config.toml" ]; then
    cat > "$ETC/aenv/config.toml" <<TOML
# AgentENV server settings; every key and its default: docs/configuration.md.
[server]
role = "$ROLE"
host = "127.0.0.1"
port = 8000

[paths]
home = "/var/lib/aenv"
TOML
fi

cat > "$ETC/systemd/system/aenv.service" <<UNIT
[Unit]
Description=AgentENV sandbox server ($ROLE)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
Environment=AENV_CONFIG=/etc/aenv/config.toml
ExecStartPre=$PREFIX/bin/aenv kit build
ExecStart=$PREFIX/bin/aenv server
# VMs and the block daemon outlive the server by design: stop only the server itself.
KillMode=process
TimeoutStopSec=60
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
UNIT

if [ "$ROOT" = / ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now aenv.service
    echo "aenv is running: systemctl status aenv; the API key is in /var/lib/aenv/secrets/api-key"
else
    echo "installed into $ROOT (systemd not started)"
fi
