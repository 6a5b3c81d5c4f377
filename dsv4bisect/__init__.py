"""dsv4bisect: find the speed patch (or interaction) that breaks a DeepSeek-V4 deployment."""

__version__ = "0.1.0"
