"""Programs that run on the cluster nodes (shipped as package ``svconsole_scripts``)."""
