"""What both modes forward through: the forwarder thread, its send path and commit
points, transactions, failures and dead letters."""
