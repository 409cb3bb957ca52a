"""Cancel and reschedule in level mode: the markers reader, the book, the gate and
each worker's side."""
