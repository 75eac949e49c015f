"""What every module is handed: the settings (``kz.yaml``), the tokens, and the ``Daemon`` port to the shared state."""
