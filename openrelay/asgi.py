import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openrelay.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402

from openrelay.web.asgi_handler import BoundedASGIHandler  # noqa: E402

# Django's handler, with at most OPENRELAY_WEB_CONCURRENCY requests in views at once.
django_asgi_app = BoundedASGIHandler(settings.OPENRELAY_WEB_CONCURRENCY)

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from batches.dashboard.routing import websocket_urlpatterns  # noqa: E402
from openrelay.web.webserver import HeaderCap  # noqa: E402

# HeaderCap: the 431 for oversized heads under any server (uvicorn with openrelay.web.webserver's
# protocols already refuses them while reading).
application = HeaderCap(
    ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)
