"""Bytes in and out of a request, each wait bounded: a client's body (``bodies``), file
ranges sent by sendfile (``sendfile``), HTTP Range requests (``ranges``)."""
