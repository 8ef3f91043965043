#!/bin/sh
# AgentENV guest /init (busybox sh in the initramfs). Mounts the read-only runtime disk at
# /rt, sets up the network from aenv.* kernel arguments, then hands PID 1 to busybox init,
# which runs and respawns the agent. The user's disk is attached by the agent on its first
# /init call, not here: a VM restored from a boot snapshot gets its disk only then.
export PATH=/bin:/sbin

AGENT_PORT=@ENVD_PORT@
RUNTIME_LABEL=aenv-runtime

fatal() {
    echo "aenv: FATAL $*"
    sync
    poweroff -f
    # Only reached if power-off failed; exiting PID 1 panics, and panic=-1 ends the VM.
    exit 1
}

mount -t proc proc /proc || fatal "mount /proc"
mount -t sysfs sysfs /sys || fatal "mount /sys"
mount -t devtmpfs devtmpfs /dev || fatal "mount /dev"

while read -r mod; do
    insmod "/lib/modules/$mod.ko" || fatal "insmod $mod"
done </lib/modules/load-order

# Free guest memory is reported to the VMM (which hands it back to the host) page by page.
# The kernel's default, 2 MiB blocks, leaves most of a fragmented guest's free memory
# unreported, and compacting it into blocks would write pages the host shares between
# clones. Set once virtio_balloon has registered: Linux 6.1 overwrites a command-line value
# with the default at registration.
echo 0 >/sys/module/page_reporting/parameters/page_reporting_order ||
    echo "aenv: free page reporting keeps the kernel's block size"

AENV_IP=
AENV_GW=
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        aenv.ip=*) AENV_IP="${arg#aenv.ip=}" ;;
        aenv.gw=*) AENV_GW="${arg#aenv.gw=}" ;;
    esac
done

# The runtime disk is found by label: the VMM's device order is not a contract.
find_label() {
    tries=0
    while [ "$tries" -lt 100 ]; do
        dev="$(findfs "LABEL=$1" 2>/dev/null)" && [ -n "$dev" ] && { echo "$dev"; return 0; }
        tries=$((tries + 1))
        usleep 50000
    done
    return 1
}

RT_DEV="$(find_label "$RUNTIME_LABEL")" || fatal "no disk labelled $RUNTIME_LABEL"

mkdir -p /rt
mount -t ext4 -o ro "$RT_DEV" /rt || fatal "mount runtime disk $RT_DEV"

# The agent's view (/rt).
mount -t proc proc /rt/proc || fatal "mount /rt/proc"
mount -t sysfs sysfs /rt/sys || fatal "mount /rt/sys"
mount -t devtmpfs devtmpfs /rt/dev || fatal "mount /rt/dev"
mkdir -p /rt/dev/pts /rt/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts /rt/dev/pts ||
    fatal "mount devpts"
# Point ptmx at this devpts instance, as container runtimes do.
rm -f /rt/dev/ptmx && ln -s pts/ptmx /rt/dev/ptmx
mount -t tmpfs -o mode=1777,nosuid,nodev shm /rt/dev/shm || fatal "mount /rt/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /rt/tmp || fatal "mount /rt/tmp"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /rt/run || fatal "mount /rt/run"

hostname sandbox

ip link set lo up || fatal "lo up"
if [ -n "$AENV_IP" ]; then
    ip link set eth0 up || fatal "eth0 up"
    ip addr add "$AENV_IP" dev eth0 || fatal "address $AENV_IP on eth0"
    if [ -n "$AENV_GW" ]; then
        ip route add default via "$AENV_GW" || fatal "default route via $AENV_GW"
    fi
fi

cat >/aenv-agent <<AGENT
#!/bin/sh
echo "aenv: agent starting"
chroot /rt /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/opt/aenv \
    /usr/bin/python3 -m aenv_agent --port $AGENT_PORT --rootfs /rootfs --guest
echo "aenv: agent exited with status \$?"
# Respawning at once would spin if the agent cannot start at all.
sleep 1
AGENT

cat >/aenv-shutdown <<'SHUTDOWN'
#!/bin/sh
echo "aenv: shutting down"
kill -TERM -1 2>/dev/null
usleep 300000
kill -KILL -1 2>/dev/null
sync
for m in run dev/shm dev/pts dev sys proc; do umount -l "/rt/rootfs/$m" 2>/dev/null; done
mount -o remount,ro /rt/rootfs || umount -l /rt/rootfs
sync
SHUTDOWN

mkdir -p /etc
cat >/etc/inittab <<'INITTAB'
::respawn:/bin/sh /aenv-agent
::ctrlaltdel:/bin/poweroff
::shutdown:/bin/sh /aenv-shutdown
INITTAB

exec /bin/busybox init
