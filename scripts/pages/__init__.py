"""The renderer's helpers that are more than a format: the layer diagram read from the imports, a claim's status
from its comparisons, units and the distance of a record from HEAD."""
