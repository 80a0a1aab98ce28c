from django.core.management.base import BaseCommand, CommandError

from openrelay.simulator import cli, server


class Command(BaseCommand):
    help = (
        "Run the simulated OpenAI-compatible model server (deterministic answers, "
        "fault knobs; see openrelay/simulator/__init__.py for the directives)."
    )
    # The simulator touches no database; skip the checks so it starts at once.
    requires_system_checks = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        cli.add_arguments(parser)

    def handle(self, *args, **options):
        try:
            config = cli.config_from_options(options)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        server.serve(config, options["host"], options["port"])
