"""The Kubeflow pipeline: components, definition, local runner and the KFP API client."""
