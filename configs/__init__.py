"""Package marker: this directory installs as `transformer.gin` (gin files).

setup.py maps the package `transformer.gin` onto configs/, so a wheel holds
the gin tree under transformer/gin/; there is no `configs` package.
"""
