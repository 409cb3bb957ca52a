"""What was delivered, exactly-once: the delivery log, replicas' progress, the takeover."""
