"""The patches' SGLang hook bodies and the SGLang symbols they hook: below the patches, which
point to their planners (`PATCH.planners.sglang`), and below the plugin, which installs them.
Importing a module here imports no torch and no SGLang: the hook bodies do, when they run."""
