"""An application module that raises while it is imported (a config it cannot find, say).
Imported only by a deploy's build worker, whose error names it in one line."""

raise RuntimeError("MODEL_DIR is not set")
