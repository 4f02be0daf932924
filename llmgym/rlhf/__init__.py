"""Learning from preferences: preference pairs, Bradley-Terry reward models, LLM graders.

Example:
    >>> from llmgym.rlhf.preferences import PreferencePair
    >>> PreferencePair.__name__
    'PreferencePair'
"""

__all__: list[str] = []
