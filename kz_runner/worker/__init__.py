"""The runner side: claim jobs, run each step contained, seal the workdir, report."""
