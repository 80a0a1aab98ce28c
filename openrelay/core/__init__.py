"""The core: organizations, members, API keys and their authentication, the model catalog (Model,
Deployment, DeploymentHealth). The Django app `openrelay.core`, labelled `openrelay` (its tables and
migrations kept that name). Imports no app, only openrelay.api and openrelay.lib."""
