"""A shop whose orders are fusee workflows (an example project: copy it)."""
