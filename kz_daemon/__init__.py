"""kz_daemon: the imperative shell — spool intake, queue, accept saga, git, HTTP shim."""
