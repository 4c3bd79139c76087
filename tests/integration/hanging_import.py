"""An application module whose import never returns (a blocked network call, say).
Imported only by a deploy's build worker, which the build deadline kills."""

import time

time.sleep(3600)


class Model:
    def __call__(self) -> str:
        return "never built"
