//! `ferrio.config`'s native half: reading and changing the process-wide settings by name.
//!
//! Names, variables, units, docs and defaults all come from the library's table
//! ([`ferrio::config::SETTINGS`]); a setting is named `task_size` or by its variable
//! `FERRIO_TASK_SIZE`. Values are parsed by the library's one parser, so a bad value raises a
//! `ValueError` that names the setting, the value and every accepted form.

use std::sync::Mutex;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use ferrio::config::{SettingInfo, SETTINGS};
use ferrio::Settings;

use crate::errors::to_pyerr;

/// Serializes read-modify-write changes of the process-wide settings from Python threads.
static CHANGE: Mutex<()> = Mutex::new(());

/// A setting's value as Python gives it (`int`, `bool` or `str`), as the text the library's
/// parser reads: `4194304`, `True`, `"4MiB"`, `"auto"`.
pub(crate) struct SettingText(pub(crate) String);

impl<'a, 'py> FromPyObject<'a, 'py> for SettingText {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = obj.cast::<PyBool>() {
            // As Python writes it, which the on/off parsers read (any case), so that a bool given
            // to a size or a count is named as given in the error: `invalid value "True"`.
            return Ok(SettingText(
                if b.is_true() { "True" } else { "False" }.into(),
            ));
        }
        if obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyString>() {
            return Ok(SettingText(obj.str()?.to_str()?.to_string()));
        }
        // Another integer type (numpy's `np.int64(4096)`): what `operator.index` makes of it.
        if obj.hasattr(pyo3::intern!(obj.py(), "__index__"))? {
            let py = obj.py();
            let int = py
                .import(pyo3::intern!(py, "operator"))?
                .call_method1(pyo3::intern!(py, "index"), (obj,))?;
            return Ok(SettingText(int.str()?.to_str()?.to_string()));
        }
        Err(PyTypeError::new_err(format!(
            "a setting's value is an int, a bool or a str (such as 4194304, True or \"4MiB\"), \
             not {}",
            obj.get_type().name()?
        )))
    }
}

/// The library's description of a setting given by name or variable.
fn info(name: &str) -> PyResult<&'static SettingInfo> {
    ferrio::config::setting(name).ok_or_else(|| {
        let names: Vec<&str> = SETTINGS.iter().map(|i| i.name).collect();
        PyValueError::new_err(format!(
            "unknown setting {name:?}: expected one of {} (or their FERRIO_* variables)",
            names.join(", ")
        ))
    })
}

/// A setting of `settings` as a Python value: `bool` for on/off settings, `int` for numbers,
/// `str` for the rest (`"auto"`).
fn value<'py>(
    py: Python<'py>,
    settings: &Settings,
    info: &SettingInfo,
) -> PyResult<Bound<'py, PyAny>> {
    let text = settings.get(info.name).map_err(to_pyerr)?;
    Ok(if info.unit == "on/off" {
        PyBool::new(py, text == "on").to_owned().into_any()
    } else if let Ok(n) = text.parse::<u64>() {
        n.into_pyobject(py)?.into_any()
    } else {
        PyString::new(py, &text).into_any()
    })
}

/// The value of one process-wide setting, by name (`task_size`) or variable (`FERRIO_TASK_SIZE`).
#[pyfunction]
pub(crate) fn config_get<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    value(py, &Settings::global(), info(name)?)
}

/// Changes process-wide settings, all or none; returns the previous values of the changed
/// settings by canonical name (what restoring them takes).
#[pyfunction]
pub(crate) fn config_set<'py>(
    py: Python<'py>,
    values: Vec<(String, SettingText)>,
) -> PyResult<Bound<'py, PyDict>> {
    let _serial = CHANGE.lock().unwrap_or_else(|p| p.into_inner());
    let old = Settings::global();
    let mut new = old.clone();
    let previous = PyDict::new(py);
    for (name, SettingText(text)) in &values {
        let info = info(name)?;
        previous.set_item(info.name, value(py, &old, info)?)?;
        new.set(name, text).map_err(to_pyerr)?;
    }
    Settings::set_global(new);
    Ok(previous)
}

/// Every process-wide setting by canonical name.
#[pyfunction]
pub(crate) fn config_settings(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let settings = Settings::global();
    let all = PyDict::new(py);
    for info in SETTINGS {
        all.set_item(info.name, value(py, &settings, info)?)?;
    }
    Ok(all)
}

/// `(name, variable, unit, description, default)` of every setting, straight from the library's
/// table; the default is text in the form the variable takes.
#[pyfunction]
pub(crate) fn config_describe() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
)> {
    SETTINGS
        .iter()
        .map(|i| (i.name, i.env, i.unit, i.doc, i.default))
        .collect()
}

/// The error in the `FERRIO_*` environment found at start-up (the defaults are in force then),
/// or None.
#[pyfunction]
pub(crate) fn env_error() -> Option<String> {
    Settings::env_error()
}

/// One line per `FERRIO_*` variable that names no setting (ignored), with the nearest setting's
/// variable where one is near.
#[pyfunction]
pub(crate) fn env_warnings() -> Vec<String> {
    Settings::env_warnings()
}
