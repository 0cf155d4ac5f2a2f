"""Files on disk: a recipe's engines folder (atomic commits, manifest, lock), its name, the
rules for opening files of planted folders, and the confinement of paths in recipes."""
