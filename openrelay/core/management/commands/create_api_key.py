from django.core.management.base import BaseCommand, CommandError

from openrelay.core.models import ApiKey, Organization


class Command(BaseCommand):
    help = "Print a new API key for an organization (the key is the last line)."

    def add_arguments(self, parser):
        parser.add_argument("org_name")
        parser.add_argument("--name", default="created by create_api_key")

    def handle(self, org_name, name, **options):
        org = Organization.objects.filter(name=org_name).first()
        if org is None:
            raise CommandError(f"No organization named {org_name!r}.")
        _, plaintext = ApiKey.issue(org, name=name)
        self.stdout.write(f"New API key for {org.name}:")
        self.stdout.write(plaintext)
