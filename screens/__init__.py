"""svconsole's Textual user interface. It shows what ``console`` gives it and does no I/O."""
