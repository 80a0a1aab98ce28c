import getpass
import os

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from openrelay.core.models import Membership, Organization

PASSWORD_VARIABLE = "OPENRELAY_USER_PASSWORD"


class Command(BaseCommand):
    help = (
        "Create a dashboard user in an existing organization. The password is read from "
        f"{PASSWORD_VARIABLE}, or prompted for."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--org", required=True, help="Name of the organization the user belongs to.")
        parser.add_argument(
            "--staff",
            action="store_true",
            help="Also let the user into /admin/ as an operator (staff and superuser: every organization).",
        )

    def handle(self, username, org, staff, **options):
        organization = Organization.objects.filter(name=org).first()
        if organization is None:
            raise CommandError(f"No organization named {org!r}; create it first with `manage.py create_org {org}`.")
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            raise CommandError(f"User {username!r} already exists.")
        password = self._password(username)
        with transaction.atomic():
            user = User.objects.create_user(username, password=password, is_staff=staff, is_superuser=staff)
            Membership.objects.create(user=user, organization=organization)
        role = " (staff: may use /admin/)" if staff else ""
        self.stdout.write(f"Created user {username} in organization {organization.name}{role}.")

    def _password(self, username):
        password = os.environ.get(PASSWORD_VARIABLE)
        if password is None:
            password = getpass.getpass(f"Password for {username}: ")
            if getpass.getpass("Password (again): ") != password:
                raise CommandError("The passwords do not match.")
        if not password:
            raise CommandError(f"The password is empty; set {PASSWORD_VARIABLE} or type one.")
        try:
            validate_password(password)
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        return password
