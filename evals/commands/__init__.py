"""The harness's subcommands of ``semverify``, one module each, registered as entry points in the
``semverify.commands`` group (pyproject.toml): the library finds them there and never imports them."""
