//! What the administrative commands and the registry records are, apart from how `apply` handles them
//! (`crate::apply::admin`): the command and storage layers name them, and the handlers sit above both.

use serde::{Deserialize, Serialize};

use crate::model::account::{Account, AccountUpdate};
use crate::model::qos::Qos;
use crate::model::reservation::{Reservation, ReservationUpdate};
use crate::model::role::RoleGrant;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminOp {
    AddAccount(AccountUpdate),
    ModifyAccount(AccountUpdate),
    DeleteAccount(String),
    /// Adds (`create`) or replaces a QOS.
    PutQos {
        qos: Qos,
        create: bool,
    },
    DeleteQos(String),
    CreateReservation(Reservation),
    UpdateReservation(ReservationUpdate),
    DeleteReservation(String),
    /// Grants an administrative level to a uid; `AdminLevel::None` takes it away.
    SetRole(RoleGrant),
    /// `scontrol update nodename=LIST spare=yes|no`: puts nodes into the hot-spare pool or takes them out
    /// (operators may, as they may drain).
    SetNodeSpare {
        names: Vec<String>,
        spare: bool,
    },
}

impl AdminOp {
    pub fn kind(&self) -> &'static str {
        match self {
            AdminOp::AddAccount(_) => "add_account",
            AdminOp::ModifyAccount(_) => "modify_account",
            AdminOp::DeleteAccount(_) => "delete_account",
            AdminOp::PutQos { .. } => "put_qos",
            AdminOp::DeleteQos(_) => "delete_qos",
            AdminOp::CreateReservation(_) => "create_reservation",
            AdminOp::UpdateReservation(_) => "update_reservation",
            AdminOp::DeleteReservation(_) => "delete_reservation",
            AdminOp::SetRole(_) => "set_role",
            AdminOp::SetNodeSpare { .. } => "set_node_spare",
        }
    }
}

/// A registry record, as the storage layer keeps it (one key per object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Object {
    Account(Account),
    Qos(Qos),
    Reservation(Reservation),
    Role(RoleGrant),
}

impl Object {
    /// The storage key: kind and name, so one column family holds them all.
    pub fn key(&self) -> String {
        match self {
            Object::Account(a) => format!("account/{}", a.name),
            Object::Qos(q) => format!("qos/{}", q.name),
            Object::Reservation(r) => format!("reservation/{}", r.name),
            Object::Role(g) => format!("role/{}", g.uid),
        }
    }
}
