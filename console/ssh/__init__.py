"""Reaching the nodes: ``pool`` (one SSH connection per node, bounded fan-out, streams, sudo,
health), ``hostkeys`` (svconsole's own known_hosts policy), ``remote`` (the node-side scripts
sent over SSH) and ``loopback`` (real sshd nodes on 127.0.1.x for tests and the walkthrough).

May import only ``console.cluster.model``, ``console.atomic`` and ``console.subscribers``: the
transport knows nothing of probes, setup steps, training or GPUs."""
