"""The marker protocol both modes speak: what an id names (`level_ids`, `precise_ids`),
what a marker asks (`requests`), the answers on the outcomes topic (`replies`), waiting
for one (`outcome`), what the SDK's cancel and reschedule return (`receipt`), and the
partition counts the SDK places ids by (`topic_partitions`)."""
