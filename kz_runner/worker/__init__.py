"""The runner side: claim jobs, run each step in its sandbox, seal the workdir, report."""
