"""The Ray layer: Ray Train runs, Ray Data streaming and Ray Tune trials on top of the library.

Thin by design: it decides where processes run and where data and results go; the training
loop itself is ``trainer_core.train.trainer`` unchanged.
"""
