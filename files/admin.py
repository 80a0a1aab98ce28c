from django.contrib import admin

from files.models import File


@admin.register(File)
class FileAdmin(admin.ModelAdmin):
    """Metadata only; the bytes are downloaded through the API or the dashboard."""

    list_display = ("public_id", "organization", "filename", "purpose", "bytes", "pins", "created_at", "expires_at")
    list_filter = ("purpose", "organization")
    search_fields = ("public_id", "filename", "organization__name")
    readonly_fields = (
        "public_id",
        "organization",
        "filename",
        "purpose",
        "bytes",
        "storage_name",
        "created_at",
        "expires_at",
        "pins",
    )

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
