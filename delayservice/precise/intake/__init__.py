"""From the precise topic to the slot files: records and markers read, offsets committed."""
