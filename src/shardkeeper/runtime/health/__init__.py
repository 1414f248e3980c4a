"""Whether this instance is still fit to own items: liveness, the commit watch and
its health, the gray-link guard."""
