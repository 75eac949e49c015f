"""Kernel source over HTTP: a kernel's files, records and tarballs at any commit, as API and as pages."""
