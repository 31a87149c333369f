"""``IterableDataset`` of the stand-in: a type TransformerLens names in annotations and isinstance checks."""


class IterableDataset:
    """Never instantiated: nothing in the GPU check makes a dataset."""
