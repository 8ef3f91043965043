#!/bin/sh
# A node builds (or finds) the guest kit before it serves; everything else runs as asked.
set -e
if [ "$1" = "server" ] && [ "${AENV_SERVER_ROLE:-all}" != "control" ]; then
    # Docker mounts /proc/sys read-only without --privileged; sandboxes' namespaces need
    # their own sysctls (SYS_ADMIN, which a node has anyway, allows the remount).
    mount -o remount,rw /proc/sys 2>/dev/null || true
    aenv kit build
fi
exec aenv "$@"
