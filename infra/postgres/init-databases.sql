-- Runs once, when the PostgreSQL volume is first initialised (docker-entrypoint-initdb.d), as the
-- POSTGRES_USER `layerlab`, which owns every database of the stack:
--   layerlab     the sweep queue and API tokens (created from POSTGRES_DB; migrated by `layerlab migrate`)
--   mlflow       MLflow's backend store (runs, metrics, model registry; migrated by the MLflow server)
--   mlflow_auth  MLflow's basic-auth users and permissions
-- The Kubernetes manifests carry a copy (infra/k8s/postgres.yaml); tests/infra checks they agree.
CREATE DATABASE mlflow OWNER layerlab;
CREATE DATABASE mlflow_auth OWNER layerlab;
