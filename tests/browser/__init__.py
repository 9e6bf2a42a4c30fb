"""Browser tests: the Airflow UI extension in headless Chromium (Debian's, driven by Playwright)."""
