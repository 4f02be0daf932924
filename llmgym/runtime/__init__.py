"""What a run needs around the algorithm: models, logging, display, threads, metrics, torch.distributed.

Example:
    >>> from llmgym.runtime.display import make_console
    >>> make_console() is not None
    True
"""

__all__: list[str] = []
