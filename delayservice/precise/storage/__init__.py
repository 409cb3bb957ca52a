"""What precise mode keeps on disk: slot and span files, the id logs, the data directory."""
