from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from openrelay.core.models import ApiKey, Organization


class Command(BaseCommand):
    help = "Create an organization and print a new API key for it (the key is the last line)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--workflows", action="store_true", help="Enable workflows for the organization.")
        parser.add_argument(
            "--max-concurrency",
            type=int,
            default=0,
            metavar="N",
            help="Most model calls the organization's batches keep in flight at once (0: no cap).",
        )

    @transaction.atomic
    def handle(self, name, workflows, max_concurrency, **options):
        if Organization.objects.filter(name=name).exists():
            raise CommandError(f"Organization {name!r} already exists; use create_api_key for another key.")
        if max_concurrency < 0:
            raise CommandError("--max-concurrency must be 0 (no cap) or more.")
        org = Organization.objects.create(name=name, workflows_enabled=workflows, max_concurrency=max_concurrency)
        _, plaintext = ApiKey.issue(org, name="created by create_org")
        self.stdout.write(f"Created organization {org.name} (workflows {'on' if workflows else 'off'}). API key:")
        self.stdout.write(plaintext)
