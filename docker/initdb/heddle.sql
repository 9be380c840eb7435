-- The trajectory store's database; Heddle applies its Alembic migrations on start.
CREATE DATABASE heddle;
