"""The timing wheel: slots in memory, loaded from disk and taken when due."""
