"""`dsv4bisect profile validate|show|new|schema`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml

from dsv4bisect.cli.options import Disable, Enable, Json, Only, ProfileArg, Set, overrides
from dsv4bisect.config.resolve import load_profile, resolve, resolve_loaded
from dsv4bisect.errors import ConfigError, Dsv4BisectError, ExitCode
from dsv4bisect.redact import redact, redact_text, secrets_in
from dsv4bisect.ui.console import console, error, stdout

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # the schema's `name` pattern, bounded

profile_app = typer.Typer(help="Validate, show, create profiles; export the schema.",
                          no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")


@profile_app.command("validate")
def validate_cmd(
    profiles: Annotated[list[str], typer.Argument(help="Profile files or built-in names.")],
    enable: Enable = None, disable: Disable = None, only: Only = None, sets: Set = None,
) -> None:
    """Check profiles (with the overrides applied to each); each error is printed as
    file:line:col: message. Exit 5 if any is bad."""
    bad = 0
    for ref in profiles:
        try:
            cfg = resolve(ref, overrides(enable, disable, only, sets))
        except Dsv4BisectError as exc:
            bad += 1
            error(redact_text(exc.message, ()), exc.hint)
            continue
        note = f"  (cannot start: {cfg.cannot_start})" if cfg.cannot_start else ""
        print(f"ok  {ref}  {cfg.profile}  fingerprint {cfg.fingerprint}{note}")
    if bad:
        raise typer.Exit(int(ExitCode.BAD_INPUT))


@profile_app.command("show")
def show_cmd(
    profile: ProfileArg,
    resolved: Annotated[bool, typer.Option("--resolved", help="Show the engine configuration: "
                                           "processes, argv, env, patches, fingerprint.")] = False,
    why: Annotated[bool, typer.Option("--why", help="Show which file or flag set each value.")] = False,
    json_out: Json = False,
    enable: Enable = None, disable: Disable = None, only: Only = None, sets: Set = None,
) -> None:
    """Show a profile after extends and overrides, or (--resolved) what it resolves to."""
    loaded = load_profile(profile, overrides(enable, disable, only, sets))
    if not resolved:
        # The raw data holds env values and args as written: scrub them like the resolved view.
        secrets = secrets_in(loaded.layered.data)  # without resolving: `show` must not need to
        data = redact(loaded.profile.model_dump(exclude={"extends"}, exclude_defaults=not why),
                      secrets)
        if json_out:
            print(json.dumps(data, indent=2))
        else:
            print(yaml.safe_dump(data, sort_keys=False), end="")
        if why:
            _print_provenance(redact(resolve_loaded(loaded).provenance, secrets), json_out)
        return
    cfg = resolve_loaded(loaded)
    if json_out:
        data = cfg.to_json()
        if not why:
            data.pop("provenance")
        print(json.dumps(data, indent=2))
        return
    from dsv4bisect.cli.render_config import render_engine_config

    render_engine_config(cfg, stdout())
    if why:
        _print_provenance(cfg.to_json()["provenance"], False)


def _print_provenance(provenance: dict[str, str], json_out: bool) -> None:
    if json_out:
        return
    width = max(map(len, provenance), default=0)
    print("\n# where each value comes from")
    for key, source in provenance.items():
        print(f"{key.ljust(width)}  {source}")


@profile_app.command("new")
def new_cmd(
    name: Annotated[str, typer.Argument(help="Name of the new profile (also its file name).")],
    base: Annotated[Optional[str], typer.Option(
        "--from", help="Extend this profile: the starter inherits all of it (its values shown "
        "commented out), so it resolves to the same experiment until you edit it.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="File to write.")] = None,
) -> None:
    """Write a commented starter profile that validates."""
    from dsv4bisect.config.starter import starter_profile

    if not NAME.fullmatch(name):
        # The name becomes the file name and the profile's `name:`; a path here would write
        # outside the current directory (`../../etc/x`). Use --output for another place.
        raise ConfigError(f"profile name {name[:60]!r} is not a plain name",
                          "use letters, digits, `.`, `_`, `-` (at most 64, no `/`); "
                          "--output PATH chooses where the file goes")
    path = output or Path(f"{name}.yaml")
    if path.exists():
        raise ConfigError(f"{path} exists", "choose another name or --output, or delete it")
    inherited, extends = None, base
    if base is not None:
        from dsv4bisect.config.layering import builtin_dir, find_profile

        found = find_profile(base)  # fail early on a missing base
        inherited = load_profile(base).profile
        if found.parent != builtin_dir():  # `extends` is relative to the new file
            extends = os.path.relpath(found, path.resolve().parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(starter_profile(name, extends, file=str(path), inherited=inherited))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}",
                          "check that the directory exists and is writable") from None
    resolve(str(path))
    console().print(f"wrote {path}; next: dsv4bisect profile show {path} --resolved --why",
                    markup=False)


@profile_app.command("schema")
def schema_cmd() -> None:
    """Print the profile JSON Schema (for editors: yaml-language-server $schema)."""
    from dsv4bisect.config.schema import Profile

    schema = Profile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "dsv4bisect profile"
    print(json.dumps(schema, indent=2))
