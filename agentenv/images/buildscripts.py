"""Shell the template builder runs as root in a build sandbox: E2B's `user` and its sudo
rule, the `systemctl` stand-in (`systemctl.sh`), and growing the root filesystem."""

from __future__ import annotations

import shlex
from importlib.resources import files

# E2B's default user: every build without a USER ends as it, with password-less sudo.
DEFAULT_USER = "user"
# Where the guest's runtime disk is seen from a sandbox process (PID 1 runs in the
# initramfs, which mounts it at /rt): its e2fsprogs grow the user's disk online.
RUNTIME = "/proc/1/root/rt"
RUNTIME_LIBS = f"{RUNTIME}/usr/lib/x86_64-linux-gnu"
# Where that runtime sees the user's disk mounted (`guest/init.sh`: --rootfs).
ROOTFS_IN_RUNTIME = "/rootfs"


def sudo_rule(user: str) -> str:
    """`user`'s password-less sudo rule in /etc/sudoers.d, 0440 as sudo wants it; written
    even without sudo, so a later step that installs sudo finds it (sudo's /etc/sudoers
    includes the directory, and dpkg leaves files it does not own alone)."""
    name = shlex.quote(user)
    rule = shlex.quote(f"{user} ALL=(ALL:ALL) NOPASSWD: ALL")
    return "\n".join(
        [
            "mkdir -p /etc/sudoers.d && chmod 0750 /etc/sudoers.d",
            f"printf '%s\\n' {rule} > /etc/sudoers.d/{name}",
            f"chmod 0440 /etc/sudoers.d/{name}",
        ]
    )


def user_script(user: str) -> str:
    """Make account `user` unless the image has it (an image's own `useradd -m user` ran
    first and is respected): the image's useradd or adduser, else by hand. E2B's `user`
    gets its sudo rule either way; an account the builder makes gets one too."""
    name = shlex.quote(user)
    make = "\n".join(
        [
            "shell=/bin/sh; [ -x /bin/bash ] && shell=/bin/bash",
            "if command -v useradd >/dev/null 2>&1; then",
            f'  useradd -m -s "$shell" {name}',
            "elif command -v adduser >/dev/null 2>&1; then",
            f'  adduser -D -s "$shell" {name}',
            "else",
            "  uid=1000",
            '  while grep -q "^[^:]*:[^:]*:$uid:" /etc/passwd; do uid=$((uid + 1)); done',
            f'  echo "{user}:x:$uid:$uid::/home/{user}:$shell" >> /etc/passwd',
            f'  echo "{user}:x:$uid:" >> /etc/group',
            f'  mkdir -p /home/{name} && chown "$uid:$uid" /home/{name}',
            "fi",
        ]
    )
    if user == DEFAULT_USER:
        return f"set -e\nid -u {name} >/dev/null 2>&1 || {{\n{make}\n}}\n{sudo_rule(user)}"
    return f"set -e\nid -u {name} >/dev/null 2>&1 && exit 0\n{make}\n{sudo_rule(user)}"


def systemctl_script() -> str:
    """Install `systemctl.sh` as /usr/local/bin/systemctl, and as /usr/bin/systemctl where
    that is missing or systemd's (diverted aside: guests have no systemd to talk to)."""
    body = (files(__package__) / "systemctl.sh").read_text()
    marker = "AENV_SYSTEMCTL_EOF"
    return "\n".join(
        [
            "set -e",
            "mkdir -p /usr/local/bin",
            f"cat > /usr/local/bin/systemctl <<'{marker}'",
            body.rstrip("\n"),
            marker,
            "chmod 0755 /usr/local/bin/systemctl",
            "real=/usr/bin/systemctl",
            'if [ -e "$real" ] && ! grep -q "AgentENV.s systemctl" "$real" 2>/dev/null; then',
            "  if command -v dpkg-divert >/dev/null 2>&1; then",
            '    dpkg-divert --quiet --local --rename --divert "$real.systemd" --add "$real"',
            "  else",
            '    mv -f "$real" "$real.systemd"',
            "  fi",
            "fi",
            # A busybox or distroless image may have no /usr/bin at all.
            '[ -e "$real" ] || [ ! -d /usr/bin ] || ln -sf /usr/local/bin/systemctl "$real"',
        ]
    )


def grow_script(min_free_mb: int) -> str:
    """Grow the mounted root ext4 (online, over the disk's spare virtual size) until it has
    `min_free_mb` MiB free; never shrinks. Runs the runtime disk's resize2fs through its
    own loader and libraries, so the image needs none of them."""
    inner = "\n".join(
        [
            "set -e",
            f"root={ROOTFS_IN_RUNTIME}",
            "dev=$(awk -v r=$root '$2 == r && $3 == \"ext4\" {d = $1} END {print d}' /proc/mounts)",
            '[ -n "$dev" ] || { echo "no ext4 mounted at $root" >&2; exit 1; }',
            "avail=$(df -Pk $root | awk 'NR == 2 {print $4}')",
            f"want=$(({min_free_mb} * 1024))",
            '[ "$avail" -lt "$want" ] || exit 0',
            'info=$(dumpe2fs -h "$dev" 2>/dev/null)',
            "bs=$(echo \"$info\" | awk -F: '/^Block size/ {print $2 + 0}')",
            "blocks=$(echo \"$info\" | awk -F: '/^Block count/ {print $2 + 0}')",
            'device=$(( $(cat /sys/class/block/"${dev#/dev/}"/size) / 2 ))',
            # Metadata of the new block groups takes ~2%: ask for that much more.
            "target=$(( blocks * bs / 1024 + (want - avail) * 51 / 50 + 65536 ))",
            '[ "$target" -le "$device" ] || target=$device',
            f'echo "growing $dev to $((target / 1024)) MiB so that {min_free_mb} MiB are free"',
            'resize2fs "$dev" "${target}K"',
        ]
    )
    return "\n".join(
        [
            "set -e",
            f"rt={RUNTIME}",
            f"exec $rt/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path {RUNTIME_LIBS}"
            f" $rt/usr/sbin/chroot $rt /bin/sh -c {shlex.quote(inner)}",
        ]
    )
