"""The foundation every layer may import: release data (versions.py), the bounded loader of
every file read (bounded.py), the switch-file protocol (switching.py). Imports nothing of
dsv4bisect above errors.py and env.py; light enough for an SGLang engine process."""
