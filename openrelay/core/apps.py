from django.apps import AppConfig


class OpenRelayConfig(AppConfig):
    name = "openrelay.core"
    # The label the tables and migrations were made under (openrelay_organization, ...).
    label = "openrelay"
    verbose_name = "OpenRelay"
