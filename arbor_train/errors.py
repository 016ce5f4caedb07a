"""Errors a user's configuration or input causes (entry points print them without a traceback)."""


class ConfigError(ValueError):
    """An option, or a combination of options, that cannot work; the message names the option."""
