"""Jobs under leases: claims, renewals, releases, the reaper, and which results need a confirmation run."""
