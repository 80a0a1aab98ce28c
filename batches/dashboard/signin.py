"""Who may see the dashboard: the sign-in pages and the two decorators every page wears.

A member sees their organization's batches and files (request.organization); an operator
(is_staff) also sees the operator page. Another organization's id answers 404 in the views.
"""

from functools import wraps

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError

from openrelay.core.models import Membership


class MemberAuthenticationForm(AuthenticationForm):
    """Django's sign-in form; a user who belongs to no organization has nothing to see here."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if not Membership.objects.filter(user=user).exists():
            raise ValidationError(
                "This account belongs to no organization. Ask an operator to add it to one "
                "(manage.py add_user, or the user's page in the admin).",
                code="no_organization",
            )


login = auth_views.LoginView.as_view(
    template_name="dashboard/login.html",
    authentication_form=MemberAuthenticationForm,
    next_page="/",
    redirect_authenticated_user=True,
)
logout = auth_views.LogoutView.as_view(next_page="/")


def member_required(view):
    """Signed in and in an organization; sets request.organization."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        membership = Membership.objects.select_related("organization").filter(user=request.user).first()
        if membership is None:
            raise PermissionDenied("This account belongs to no organization.")
        request.organization = membership.organization
        return view(request, *args, **kwargs)

    return wrapped


def staff_required(view):
    """Signed in as an operator (is_staff); sets request.organization when the operator has one."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("The operator page is for operators (staff users) only.")
        membership = Membership.objects.select_related("organization").filter(user=request.user).first()
        request.organization = membership.organization if membership else None
        return view(request, *args, **kwargs)

    return wrapped
