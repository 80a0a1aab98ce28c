from django.apps import AppConfig


class OpenRelayConfig(AppConfig):
    name = "openrelay"
    verbose_name = "OpenRelay"
