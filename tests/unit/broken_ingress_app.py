"""A FastAPI ingress whose module fails to import (a missing dependency), for the
bad-input test of issue 12."""

from fastapi import FastAPI
from ray import serve

import a_dependency_that_is_not_installed  # noqa: F401

api = FastAPI()


@serve.deployment
@serve.ingress(api)
class Api:
    @api.get("/")
    def root(self) -> str:
        return "never"


app = Api.bind()
