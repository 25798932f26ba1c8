"""Headless subcommands that live outside a feature package."""
