"""The user's code: an import_path resolved, checked against its config, built into specs."""
