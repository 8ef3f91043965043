"""One sandbox's machine: boot snapshot, VM launch, guest configuration, network, mounts."""
