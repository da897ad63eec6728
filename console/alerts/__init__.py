"""Alerts while the operator is away: ``rules`` (the ``alerts:`` section of cluster.yaml, with
defaults), ``engine`` (conditions seen now become alerts: deduplicated per kind, node and rank
until they clear, rate-limited, each with its "resolved" message) and ``sinks`` (the terminal
bell and a toast through a callback, webhooks with generic, Slack and Feishu/Lark payloads, a
command hook fed the alert as JSON, and ``alerts.log`` in the state directory).

Sits on the exporter's floor: may import ``console.training``, ``console.bringup``,
``console.cluster``, ``console.gpu``, ``console.ssh``, ``console.atomic`` and
``console.subscribers``; never the commands or the CLI. Webhook URLs are secrets: they never
reach a log line, an alert text or an error message."""
