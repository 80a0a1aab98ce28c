from django.urls import path

from files import views

urlpatterns = [
    path("files", views.FilesView.as_view(), name="files"),
    path("files/<str:file_id>", views.FileView.as_view(), name="file"),
    path("files/<str:file_id>/content", views.FileContentView.as_view(), name="file-content"),
]
